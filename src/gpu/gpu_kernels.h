/* gpu_kernels: the ZAYA ops on the GPU, launched on a stream; the same maths, layouts and argument order as their
 * CPU references in src/kernels/kernels.h (a gk_ op is checked against its CPU namesake on random inputs in
 * tests/gpu/test_gpu.c). All pointers are device pointers unless a comment says host. Every backward ACCUMULATES
 * (+=) into the gradients it is given, as on the CPU. Reductions have a fixed order (no float atomics): the same
 * inputs give the same bits on every run. Launch errors surface at the next gpu_check (gpu.h). */
#ifndef ZAYA_GPU_KERNELS_H
#define ZAYA_GPU_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
#ifdef ZAYA_GPU_EMU /* tests/gpu/emu: the CPU emulation's stream type */
typedef void *GkStream;
#else
#include "gpu_runtime.h"
typedef gpuStream_t GkStream;
#endif
extern "C" {
#elif defined(ZAYA_HIP)
typedef struct ihipStream_t *GkStream;
#else
typedef struct CUstream_st *GkStream; /* = cudaStream_t */
#endif

/* ---- launches (gpu_ctx.cu) ---- */
/* Programmatic dependent launch for the kernels launched through GK_LAUNCH_PDL (gpu_common.cuh: the small kernels of
 * a decoding step): on = 1 turns it on where the current device can (compute capability 9.0 or newer, CUDA; a no-op
 * under HIP), 0 off; returns whether it is now on. For the whole process: gpu_model_create sets it from
 * ZAYA_GPU_PDL. Off until set. */
int gk_programmatic_launch(int on);
int gk_programmatic_launch_on(void);

/* ---- norms, residual merges, embedding, loss (gpu_norms.cu) ---- */
void gk_rmsnorm_forward(GkStream s, float *y, float *rstd, const float *x, const float *w, int rows, int dim, float eps);
void gk_rmsnorm_backward(GkStream s, float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int rows, int dim);
void gk_merge_rmsnorm_forward(GkStream s, float *out, float *y, float *rstd, const float *h, const float *res,
                              const float *hs, const float *hb, const float *rs, const float *rb, const float *w,
                              int rows, int dim, float eps);
void gk_rmsnorm_merge_backward(GkStream s, float *dx, float *dh, float *dw, float *dhs, float *dhb, float *drs,
                               float *drb, const float *du, const float *x, const float *w, const float *rstd,
                               const float *h, const float *res, const float *hs, const float *hb, const float *rs,
                               const float *rb, int rows, int dim);
/* x = (emb[tokens[r]] + bias) ⊙ scale, [rows, dim]; the rows from emb16 (bf16, widened exactly) where it is set,
 * else from emb (fp32). */
void gk_embed_forward(GkStream s, float *x, const float *emb, const uint16_t *emb16, const int32_t *tokens,
                      const float *bias, const float *scale, int rows, int dim);
/* The embedding gradient without atomics: the rows grouped by token id (host-built by gk_embed_plan, uploaded),
 * each embedding row summed over its rows in order. plan_rows [rows] = row indices sorted by token (stable),
 * plan_start [n_uniq + 1] = where each distinct token's rows begin, plan_tok [n_uniq] = the tokens, *plan_count =
 * n_uniq: all on the device (the launch does not depend on the batch, so a captured graph replays any batch). */
void gk_embed_backward(GkStream s, float *demb, float *dbias, float *dscale, const float *dx, const float *emb,
                       const int32_t *tokens, const float *bias, const float *scale, int rows, int dim, int pad_id,
                       const int32_t *plan_rows, const int32_t *plan_start, const int32_t *plan_tok,
                       const int32_t *plan_count);
/* Host: builds the plan above from host tokens [rows]; returns n_uniq. plan_rows [rows], plan_start [rows + 1],
 * plan_tok [rows]; work [V] ints of scratch (V = vocabulary size). */
int gk_embed_plan(const int32_t *tokens, int rows, int V, int32_t *plan_rows, int32_t *plan_start, int32_t *plan_tok,
                  int32_t *work);
/* Cross-entropy per row: row_loss[r] = lse − logit[target] (0 where target < 0); when dlogits, writes
 * (softmax − onehot) · *dl_scale (device float, dloss / n_valid: gk_loss_scale's; ignored rows get 0), and when
 * dlogits16 the same values' bf16 bits (nearest even, as gk_f32_to_bf16 rounds them): either, both or neither.
 * One pass over the logits (online max and sum), no probabilities kept. */
void gk_cross_entropy(GkStream s, float *dlogits, uint16_t *dlogits16, float *row_loss, const float *logits,
                      const int32_t *targets, int rows, int V, const float *dl_scale);
/* *out (device double) = Σ_r x[r] in a fixed order (one block). */
void gk_sum(GkStream s, double *out, const float *x, long n);
/* A loss pass on the device: *valid = the count of targets ≥ 0, *scale = 1 / *valid in fp32 (0 without any): the
 * cross-entropy's gradient scale. */
void gk_loss_scale(GkStream s, float *scale, int32_t *valid, const int32_t *targets, int rows);
/* *acc += (*valid ? Σ_r row_loss[r] / *valid : 0) in double (gk_sum's order): the pass's mean loss added to the
 * step's. */
void gk_loss_add(GkStream s, double *acc, const float *row_loss, long n, const int32_t *valid);

/* ---- router and experts (gpu_moe.cu) ---- */
void gk_state_rmsnorm_forward(GkStream s, float *z, float *zn, float *rstd, const float *bias, const float *r_prev,
                              const float *gamma, const float *w, int rows, int dim, float eps);
void gk_state_backward(GkStream s, float *dr_prev, float *dgamma, float *dbias, const float *dz, const float *r_prev,
                       const float *gamma, int rows, int dim);
void gk_bias_gelu_forward(GkStream s, float *pre, float *y, const float *bias, int rows, int dim);
void gk_gelu_bias_backward(GkStream s, float *dpre, float *dbias, const float *dy, const float *pre, int rows, int dim);
void gk_router_choice_forward(GkStream s, float *probs, int32_t *choice, float *gate, const float *logits,
                              const float *bias, int rows, int n_classes);
void gk_router_choice_backward(GkStream s, float *dlogits, const float *dgate, const float *probs,
                               const int32_t *choice, int rows, int n_classes);
/* The dense variant's router: choice = 0, gate = 1 for every row. */
void gk_route_all_to_one(GkStream s, int32_t *choice, float *gate, int rows);
/* Stable counting sort of the rows by choice (rows with choice >= E, the skip expert, left out), on the device:
 * off [E + 1] (off[e] = first sorted position of expert e, off[E] = routed rows), sorted [N]. One block. */
void gk_group_by_expert(GkStream s, int32_t *off, int32_t *sorted, const int32_t *choice, int N, int E);
/* One layer's routing statistics, as routing_counts_add_layer (src/model/routing.c) but overwriting: counts [E + 1]
 * = rows per choice (E: the skip expert), sums[0] = Σ gate over the routed rows, sums[1] = Σ probs[r, E] when
 * classes > E (else 0). One block; double sums in a fixed order. */
void gk_routing_stats(GkStream s, int32_t *counts, double *sums, const int32_t *choice, const float *gate,
                      const float *probs, int N, int classes, int E);
/* The experts' row ops below take their row count n (or rows) from the host, or, with n_dev set, from the device
 * (*n_dev, e.g. gk_group_by_expert's off + E: the routed rows), n then being its upper bound for the launch. */
/* dst[k] = src[idx[k]] (rows of D floats), k < n. */
void gk_gather_rows(GkStream s, float *dst, const float *src, const int32_t *idx, int n, const int32_t *n_dev, int D);
/* dst[idx[k]] += src[k] (idx distinct). */
void gk_scatter_add_rows(GkStream s, float *dst, const float *src, const int32_t *idx, int n, const int32_t *n_dev,
                         int D);
/* out[sorted[k]] = gate[sorted[k]] · y[k] for k < n; rows r with choice[r] >= E are zeroed. */
void gk_moe_combine(GkStream s, float *out, const float *y, const float *gate, const int32_t *sorted,
                    const int32_t *choice, int rows, int n, const int32_t *n_dev, int D, int E);
void gk_moe_gate_backward(GkStream s, float *dgate, float *dy, const float *dout, const float *y, const float *gate,
                          const int32_t *sorted, int n_routed, const int32_t *n_dev, int D);
/* The bf16 runs' grouped experts: gk_gather_rows and gk_moe_gate_backward with the rows they write (the expert
 * products' operands) as bf16 bits, nearest even: the values a rounding pass would give, without the pass. */
void gk_gather_rows_bf16(GkStream s, uint16_t *dst16, const float *src, const int32_t *idx, int n,
                         const int32_t *n_dev, int D);
void gk_moe_gate_backward_bf16(GkStream s, float *dgate, uint16_t *dy16, const float *dout, const float *y,
                               const float *gate, const int32_t *sorted, int n_routed, const int32_t *n_dev, int D);
void gk_swiglu_forward(GkStream s, float *act, const float *gu, int rows, const int32_t *rows_dev, int inter);
void gk_swiglu_backward(GkStream s, float *dgu, const float *dact, const float *gu, int rows, const int32_t *rows_dev,
                        int inter);
/* The bf16 runs' grouped experts: act16 = bf16(act) and dgu16 = bf16 of what gk_swiglu_backward adds to a zeroed dgu
 * (written, not accumulated): bf16 bits, nearest even, so the products read the values a rounding pass would give. */
void gk_swiglu_forward_bf16(GkStream s, uint16_t *act16, const float *gu, int rows, const int32_t *rows_dev, int inter);
void gk_swiglu_backward_bf16(GkStream s, uint16_t *dgu16, const float *dact, const float *gu, int rows,
                             const int32_t *rows_dev, int inter);
/* The experts' products over rows grouped by expert, one launch for all experts, sizes on the device
 * (gpu_expert_gemm.cu): bf16 operands (bits), fp32 accumulation and output; off [E + 1] as gk_group_by_expert's.
 * gk_expert_mm: C[r, :] = A[r, :] op(W_e) + beta C[r, :] for r in [off[e], off[e + 1]), A [rows, K] (lda), W_e = W +
 * e w_stride either [N, K] (trans_w = 1: C = A W_eᵀ, a linear layer's forward) or [K, N] (trans_w = 0: C = A W_e, its
 * input gradient); max_rows >= off[E] sizes the launch. Rows outside the experts are not touched. */
void gk_expert_mm(GkStream s, const int32_t *off, int E, int max_rows, int N, int K, const uint16_t *A, int lda,
                  const uint16_t *W, long w_stride, int trans_w, float beta, float *C, int ldc);
/* gk_expert_mm_wgrad: G_e = Σ_{r in [off[e], off[e + 1])} A[r, :]ᵀ B[r, :] + beta G_e, A [rows, M] (lda), B [rows, N]
 * (ldb), G_e = G + e g_stride [M, N] (ldg): the experts' weight gradients. */
void gk_expert_mm_wgrad(GkStream s, const int32_t *off, int E, int M, int N, const uint16_t *A, int lda,
                        const uint16_t *B, int ldb, float beta, float *G, long g_stride, int ldg);
/* Which form the grouped products run: GK_EXPERT_SM90 (the default: gk_expert_mm_sm90 below where this build has it and
 * the GPU is an sm_90 one, else the async form), GK_EXPERT_ASYNC (cp.async into a 3-deep ring of shared tiles, one
 * barrier a k-step: 95 TFLOP/s on an H200) or GK_EXPERT_STAGED (loads staged in registers, one shared tile, two
 * barriers a k-step: 82). The async and staged forms give the same bits; the sm90 form sums in another order. which:
 * one of them to choose it, -1 to ask; returns the form chosen (for the whole process: gpu_model_create sets it from
 * ZAYA_GPU_EXPERT_KERNEL). */
enum { GK_EXPERT_STAGED = 0, GK_EXPERT_ASYNC = 1, GK_EXPERT_SM90 = 2 };
int gk_expert_kernel(int which);
/* Whether gk_expert_mm_sm90 can run here: this build has it (gk_expert_sm90_built) and the current device is sm_90. */
int gk_expert_sm90_ready(void);
int gk_expert_sm90_built(void);
/* Reserves its per-stream device memory for E experts now (0, or -1 where it cannot run), so that a CUDA graph
 * captured later can hold its products (it never allocates during a capture: it falls back instead). */
int gk_expert_sm90_reserve(GkStream s, int E);
/* Frees what it holds for stream s (gpu_close, before the stream goes). */
void gk_expert_sm90_release(GkStream s);
/* The same two products on Hopper's wgmma + TMA (gpu_expert_gemm_sm90.cu, CUTLASS's sm90 grouped GEMM; built where the
 * Makefile finds CUTLASS's headers, ZAYA_CUTLASS): 0 when launched, -1 when this device (not sm_90), this build or
 * these shapes (16-byte aligned bases and leading dimensions) cannot, and nothing was queued. */
int gk_expert_mm_sm90(GkStream s, const int32_t *off, int E, int N, int K, const uint16_t *A, int lda,
                      const uint16_t *W, long w_stride, int trans_w, float beta, float *C, int ldc);
int gk_expert_mm_wgrad_sm90(GkStream s, const int32_t *off, int E, int M, int N, const uint16_t *A, int lda,
                            const uint16_t *B, int ldb, float beta, float *G, long g_stride, int ldg);

/* ---- CCA pre-processing (gpu_cca.cu) ---- */
/* M [B*(T+k1-1), C] is the depthwise output in the CPU layout (k1-1 zero rows ahead of each sequence). */
void gk_cca_conv_forward(GkStream s, float *Y, float *M, const float *X, const float *w0, const float *b0,
                         const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1);
/* dM [B*(T+k1-1), C] is scratch (overwritten). */
void gk_cca_conv_backward(GkStream s, float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM,
                          const float *dY, const float *X, const float *M, const float *w0, const float *w1, int B,
                          int T, int C, int dh, int k0, int k1);
/* bf16 runs: the same, the grouped convolution's products (Y; the backward's dM) on tensor cores with bf16 operands
 * (gpu_cca_tc.cu) where the shape allows (dh a multiple of 16, k1 <= 4), else as above; the depthwise convolution and
 * the weight gradients stay fp32. */
void gk_cca_conv_forward_bf16(GkStream s, float *Y, float *M, const float *X, const float *w0, const float *b0,
                              const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1);
void gk_cca_conv_backward_bf16(GkStream s, float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM,
                               const float *dY, const float *X, const float *M, const float *w0, const float *w1, int B,
                               int T, int C, int dh, int k0, int k1);
/* The tensor-core product itself: bwd 0 writes Y (rows t < T of each sequence, bias b1 added) from M, bwd 1 writes dM
 * (every row, overwritten; b1 unused) from dY, the layouts as gk_cca_conv_forward / _backward. bf16 operands rounded
 * nearest-even as they are staged, fp32 sums. 0, or -1 having launched nothing (dh % 16, C % dh, k1 outside 1..4). */
int gk_cca_conv_gemm_tc(GkStream s, int bwd, float *out, const float *src, const float *w1, const float *b1, int B,
                        int T, int C, int dh, int k1);
void gk_qk_mean_forward(GkStream s, float *query, float *key, const float *Y, const float *X, int rows, int Hq, int Hkv,
                        int dh);
void gk_qk_mean_backward(GkStream s, float *dY, float *dX, const float *dquery, const float *dkey, int rows, int Hq,
                         int Hkv, int dh);
void gk_delayed_value_forward(GkStream s, float *value, const float *vc, const float *vd, int B, int T, int half);
void gk_delayed_value_backward(GkStream s, float *dvc, float *dvd, const float *dvalue, int B, int T, int half);
void gk_l2norm_rope_forward(GkStream s, float *y, float *norm, const float *x, const float *temp, const float *cosv,
                            const float *sinv, int rows, int T, int H, int dh, int rd, float scale, float eps);
/* One tensor of gk_l2norm_rope_qk_forward: y, norm, x, temp as gk_l2norm_rope_forward's, over H heads. */
typedef struct {
    float *y, *norm;
    const float *x, *temp;
    int H;
} GkNormRopePart;
/* gk_l2norm_rope_forward of the query's and the key's heads in one launch (the same rows, tables and positions; a
 * part with y NULL is left out), with row r at position pos[r] (device [rows]: the rows of a ragged batch, each
 * sequence at its own place) or, pos NULL, at r % T. */
void gk_l2norm_rope_qk_forward(GkStream s, GkNormRopePart q, GkNormRopePart k, const float *cosv, const float *sinv,
                               const int32_t *pos, int rows, int T, int dh, int rd, float scale, float eps);
/* dy is the incoming gradient; like the CPU op it may be used as scratch (its values are not needed after). */
void gk_rope_l2norm_backward(GkStream s, float *dx, float *dtemp, float *dy, const float *x, const float *norm,
                             const float *temp, const float *cosv, const float *sinv, int rows, int T, int H, int dh,
                             int rd, float scale, float eps);
void gk_rope_forward(GkStream s, float *x, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd);
/* gk_rope_forward with row r at position pos[r] (device [rows]) instead of r % T: the rows of a ragged batch, each
 * sequence at its own place. */
void gk_rope_forward_pos(GkStream s, float *x, const float *cosv, const float *sinv, const int32_t *pos, int rows, int H,
                         int dh, int rd);
void gk_rope_backward(GkStream s, float *dx, const float *cosv, const float *sinv, int rows, int T, int H, int dh,
                      int rd);

/* ---- attention (gpu_attention.cu): causal GQA flash attention, the [T, T] scores never stored ---- */
/* Layouts as src/kernels/attention.h: Q, O [B*T, Hq*dh], K, V [B*T, Hkv*dh], LSE [B, Hq, T]. dh <= 256. */
void gk_flash_attention_forward(GkStream s, float *O, float *LSE, const float *Q, const float *K, const float *V,
                                int B, int T, int Hq, int Hkv, int dh);
/* Accumulates dQ, dK, dV. work: gk_flash_attention_work_floats(B, T, Hq) floats of scratch. Deterministic. */
void gk_flash_attention_backward(GkStream s, float *dQ, float *dK, float *dV, const float *dO, const float *O,
                                 const float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                                 int Hq, int Hkv, int dh, float *work);
long gk_flash_attention_work_floats(int B, int T, int Hq);
/* The same with a sliding window (window > 0: query q sees keys q-window+1 .. q, a "hybrid_sliding" layer; 0: full
 * causal, as above). */
void gk_flash_attention_forward_window(GkStream s, float *O, float *LSE, const float *Q, const float *K,
                                       const float *V, int B, int T, int Hq, int Hkv, int dh, int window);
void gk_flash_attention_backward_window(GkStream s, float *dQ, float *dK, float *dV, const float *dO, const float *O,
                                        const float *LSE, const float *Q, const float *K, const float *V, int B,
                                        int T, int Hq, int Hkv, int dh, float *work, int window);
/* The same ops (with the window) on the tensor cores for bf16 runs (gpu_attention_tc.cu): identical layouts and
 * semantics (fp32 in and out, backward accumulates, deterministic), the products on bf16-rounded Q, K, V, dO with P
 * and dS rounded to bf16 and fp32 accumulation; softmax statistics and LSE in fp32. dh 64 and 128 run on the tensor
 * cores, any other dh runs the fp32 kernels above. work: gk_flash_attention_bf16_work_floats(...) floats, 16-byte aligned (bf16
 * copies of Q, K, V, dO and Dlt); it covers the fp32 kernels' need too. */
void gk_flash_attention_forward_bf16(GkStream s, float *O, float *LSE, const float *Q, const float *K, const float *V,
                                     int B, int T, int Hq, int Hkv, int dh, int window);
void gk_flash_attention_backward_bf16(GkStream s, float *dQ, float *dK, float *dV, const float *dO, const float *O,
                                      const float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                                      int Hq, int Hkv, int dh, float *work, int window);
long gk_flash_attention_bf16_work_floats(int B, int T, int Hq, int Hkv, int dh);
/* The same ops through cuDNN's fused SDPA (gpu_attention_cudnn.cpp; built where the Makefile finds the cudnn-frontend
 * and cuDNN headers, ZAYA_CUDNN; libcudnn.so.9 loaded at run time): same layouts and semantics (the backward
 * accumulates, deterministic), bf16 operands and results, the same natural-log LSE, whose rounding differs from the
 * own kernels': a layer's backward takes the path its forward took. gk_cudnn_attention_available: the library loaded (1) or not (0);
 * gk_cudnn_attention_status: a line saying which cuDNN, or why not; gk_cudnn_attention_plan: 1 when cuDNN takes this
 * shape (both passes' graphs built, cached by shape). The passes return 0 when done, -1 when nothing ran (no library,
 * a refused shape, no scratch during a graph capture: run the own kernels) and -2 when cuDNN failed midway. */
int gk_cudnn_attention_available(void);
const char *gk_cudnn_attention_status(void);
int gk_cudnn_attention_plan(int B, int T, int Hq, int Hkv, int dh, int window);
int gk_cudnn_attention_forward(GkStream s, float *O, float *LSE, const float *Q, const float *K, const float *V, int B,
                               int T, int Hq, int Hkv, int dh, int window);
int gk_cudnn_attention_backward(GkStream s, float *dQ, float *dK, float *dV, const float *dO, const float *O,
                                const float *LSE, const float *Q, const float *K, const float *V, int B, int T, int Hq,
                                int Hkv, int dh, int window);

/* ---- cached decoding (gpu_decode_kernels.cu) ---- */
/* Decoding attention's keys in pieces (flash-decoding): at batch 1 a (row, head) a block leaves most of the GPU idle
 * and one block walks the whole context, a memory latency a few keys. With this scratch each (row, head)'s keys are
 * cut into up to GK_ATTN_PIECES pieces of GK_ATTN_PIECE_KEYS keys or a multiple (the cut a function of the key count
 * alone), attended by separate blocks at once; the block that finishes a (row, head)'s last piece combines the pieces
 * in their order, so the bits do not depend on which block that is or on how blocks share the pieces. partial:
 * [rows * Hq * GK_ATTN_PIECES, dh + 2] floats (each piece's unnormalised output, its max and its sum); count: rows * Hq
 * words, zeroed once (the combining block leaves its word zero again). partial NULL: one piece a (row, head), no
 * scratch (other bits). Pieces only where rows * Hq <= GK_ATTN_PIECE_ROWS_HEADS (past that the (row, head)s alone fill
 * the GPU, and the scratch is not touched): gk_attn_piece_rows says how many rows' scratch that takes. */
#define GK_ATTN_PIECES 16
#define GK_ATTN_PIECE_KEYS 32
#define GK_ATTN_PIECE_ROWS_HEADS 2048
typedef struct {
    float *partial;
    unsigned *count;
} GkAttnPieces;
static inline long gk_attn_piece_rows(long max_rows, int Hq) {
    const long cap = GK_ATTN_PIECE_ROWS_HEADS / (Hq > 0 ? Hq : 1);
    return max_rows < cap ? max_rows : cap;
}
/* Attention of n new queries per sequence at positions p0..p0+n-1 over the cached keys 0..p0+n-1 (causal; with
 * window > 0 query q sees keys q-window+1..q), as cached_attention in src/infer/decode.c: Q, O [B*n, Hq*dh]; Kc, Vc
 * [B, max_len, Hkv*dh]; pieces: scratch for B*n rows, or {NULL}. Deterministic. */
void gk_decode_attention(GkStream s, float *O, const float *Q, const float *Kc, const float *Vc, int B, int n, int p0,
                         int max_len, int Hq, int Hkv, int dh, int window, GkAttnPieces pieces);
/* dst[b*dst_stride + i] = src[b*src_stride + i] for i < len, b < rows (strided row copies, floats). */
void gk_copy_rows(GkStream s, float *dst, long dst_stride, const float *src, long src_stride, long len, int rows);
/* The same through index lists (device int32 [n]; NULL = the identity): dst[dst_idx[k]*dst_stride + i] =
 * src[src_idx[k]*src_stride + i] for i < len, k < n; a row k with dst_idx[k] < 0 is skipped (a list padded to a
 * count a CUDA graph keeps). The destinations must not overlap. */
void gk_copy_rows_idx(GkStream s, float *dst, long dst_stride, const int32_t *dst_idx, const float *src,
                      long src_stride, const int32_t *src_idx, long len, int n);
/* One gk_copy_rows_idx (dst: float, or uint16_t bf16 bits for the _bf16 forms), for two copies in one launch: the
 * pairs a decoding step moves together (k̂ and v into the cache; the convolution state and the new rows into their
 * blocks). No destination may overlap another, in either copy. */
typedef struct {
    void *dst;
    long dst_stride;
    const int32_t *dst_idx;
    const float *src;
    long src_stride;
    const int32_t *src_idx;
    long len;
    int n;
} GkRowCopy;
void gk_copy_rows_idx2(GkStream s, GkRowCopy a, GkRowCopy b);
void gk_copy_rows_idx2_bf16(GkStream s, GkRowCopy a, GkRowCopy b);
/* gk_cca_conv_forward's Y at rows P.. of each of B blocks of T rows only (a decoding step's new rows after its P cached
 * columns; Y's other rows are not written, M is not needed): one launch, the depthwise sums in the CPU's order, the
 * grouped products in fp32 in another order than the tiled kernels' (the CPU's cca_conv_forward_last's role). Returns
 * 0, or -1 having launched nothing (k1 > 4, dh > 256, C not whole groups, more than 65,535 new rows). */
int gk_cca_conv_decode(GkStream s, float *Y, const float *X, const float *w0, const float *b0, const float *w1,
                       const float *b1, int B, int T, int P, int C, int dh, int k0, int k1);
/* A decoding step's CCA after its convolution, for N rows in one launch (one block a row and kv head): the q-k mean
 * skip (gk_qk_mean_forward's), the QK L2 norm + RoPE (gk_l2norm_rope_qk_forward's; the norms are not written), the
 * values with a one-token delay, k̂ and v appended to the cache (fp32, or bf16 rounded nearest-even), and the
 * convolution state's copy `state` (gk_copy_rows_idx's) alongside: the same bits as those launches. Row r of a
 * sequence's consecutive rows: its column in the convolution's [state | new] blocks Xe / Ye is xrow[r], or (r / n)·TE
 * + P + r % n; its values [vc[r] | vd[r − 1]], the sequence's first row taking its slot's kept vd (vd_prev +
 * slot·slot_stride, half floats), which then becomes the sequence's last row's vd — the sequences a ragged batch's
 * row_seq [N], seq_first, seq_last, seq_slot [n_seqs] (slots distinct), or, row_seq NULL, n rows each, sequence i in
 * slot i; its RoPE row pos[r], or r % n (tables offset to the step's first position); its cache row kv_row[r], or
 * (r / n)·kv_seq + kv_p0 + r % n. All index arrays on the device. */
typedef struct GkCcaDecode {
    const float *Xe, *Ye; /* [rows, Cq + Ck] */
    const int32_t *xrow;
    int TE, P;
    const float *vc, *vd; /* [N, half], half = Ck / 2 */
    float *vd_prev;
    long slot_stride;
    const int32_t *row_seq, *seq_first, *seq_last, *seq_slot;
    const float *temp;        /* [Hkv]: the keys' temperature */
    const float *cosv, *sinv; /* [positions, rd / 2] */
    const int32_t *pos;
    float scale, eps;
    float *query;             /* [N, Cq] */
    void *k_cache, *v_cache;  /* rows of Ck: float, or uint16_t bf16 bits (kv_bf16) */
    const int32_t *kv_row;
    long kv_seq;
    int kv_p0, kv_bf16;
    GkRowCopy state;
    int N, n, Hq, Hkv, dh, rd;
} GkCcaDecode;
void gk_cca_decode_rows(GkStream s, const GkCcaDecode *a);
/* gk_decode_attention over a block pool, for the N rows of a ragged batch (gpu_model_decode_step): row r (Q, O
 * [N, Hq*dh]) belongs to the step's sequence row_seq[r], sits at position row_pos[r] and sees that sequence's keys
 * 0..row_pos[r] (the last `window` of them when window > 0); key s of sequence i is row
 * table[i*max_blocks + s/block_tokens]*block_tokens + s%block_tokens of Kp, Vp [n_blocks*block_tokens, Hkv*dh]. All
 * index arrays on the device. Deterministic. */
void gk_paged_decode_attention(GkStream s, float *O, const float *Q, const float *Kp, const float *Vp,
                               const int32_t *row_seq, const int32_t *row_pos, const int32_t *table, int max_blocks,
                               int block_tokens, int N, int Hq, int Hkv, int dh, int window, GkAttnPieces pieces);
/* The bf16 KV cache (--kv-dtype bf16): the same attention over bf16 k̂ / v (widened exactly, fp32 arithmetic in the
 * same order: the fp32 kernels' bits on the rounded values); the appends into it are gk_copy_rows_idx2_bf16's
 * (rounded nearest-even, as zy_f32_to_bf16). */
void gk_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kc, const uint16_t *Vc, int B,
                              int n, int p0, int max_len, int Hq, int Hkv, int dh, int window, GkAttnPieces pieces);
void gk_paged_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kp, const uint16_t *Vp,
                                    const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                    int max_blocks, int block_tokens, int N, int Hq, int Hkv, int dh, int window,
                                    GkAttnPieces pieces);

/* ---- few-row products: decoding's steps (gpu_skinny.cu) ----
 * The bf16 runs' product (x rounded to bf16 nearest-even, bf16 weights, fp32 sums; the sums' order is not
 * cuBLASLt's) for rows <= GK_SKINNY_ROWS, one launch reading each weight once. Each returns 0, or -1 having launched
 * nothing when the shapes do not fit (rows, K not a multiple of 8, x's rows or a weight not on 16 bytes): the caller
 * then takes the general product. */
#define GK_SKINNY_ROWS 8
#define GK_SKINNY_OUTS 4
typedef struct GkSkinnyOut {
    const uint16_t *w; /* [n, K] bf16 */
    float *y;          /* [rows, n], row stride ldy */
    int n, ldy;
    const float *bias; /* NULL, or [n]: y = gelu(bf16(x) Wᵀ + bias), gk_bias_gelu_forward's y */
} GkSkinnyOut;
/* The router MLP's tail for rows <= GK_SKINNY_ROWS in one launch (one block), the same bits as its five: z += bias
 * (+ r_prev ⊙ γ) in place and zn = RMSNorm(z; norm_w) (gk_state_rmsnorm_forward), h1 = gelu(bf16(zn) W1ᵀ + b1), h2 =
 * gelu(bf16(h1) W2ᵀ + b2), logits = bf16(h2) W_outᵀ (gk_skinny_mm) and the top-1 choice over logits with
 * balance_bias (gk_router_choice_forward). zn, h1 and h2 stay on chip (not written). Needs R a multiple of 8 and at
 * most 256 (8 · the warp size), classes <= 256, every fp32 vector and bf16 matrix on 16 bytes; else -1, nothing
 * launched. */
typedef struct GkRouterTail {
    float *z;                                          /* [rows, R], row stride R: the down projection's output */
    const float *bias, *r_prev, *gamma, *norm_w;       /* [R] each; r_prev [rows, R] or NULL (the first layer) */
    float eps;
    const uint16_t *w1, *w2, *w_out;                   /* [R, R], [R, R], [classes, R] bf16 */
    const float *b1, *b2, *balance_bias;               /* [R], [R], [classes] */
    float *logits, *probs, *gate;                      /* [rows, classes], [rows, classes], [rows] */
    int32_t *choice;                                   /* [rows] */
    int rows, R, classes;
} GkRouterTail;
int gk_skinny_router_tail(GkStream s, const GkRouterTail *t);
/* y_j = bf16(x) W_jᵀ for j < n_outs: products of the same rows x [rows, K] (row stride ldx) in one launch. Under
 * programmatic launch (gk_programmatic_launch) it loads the weights' first pieces before waiting for the kernel before
 * it: W_j must not be written by the kernel just before it (a model's weights, set before decoding, are not). */
int gk_skinny_mm(GkStream s, const float *x, int ldx, int rows, int K, const GkSkinnyOut *outs, int n_outs);
/* The experts, each row through its own (choice[r] in [0, E); others are the skip expert's), x [rows, D]:
 * act [rows, I] = silu(g) ⊙ u with [g | u] = bf16(x_r) W_gu[choice[r]]ᵀ (W_gu [E][2I, D]): gk_swiglu_forward's
 * formula, skip-expert rows untouched; out [rows, D] = gate[r] · bf16(act_r) W_down[choice[r]]ᵀ (W_down [E][D, I]),
 * 0 for the skip expert: gk_moe_combine's. */
int gk_skinny_expert_swiglu(GkStream s, float *act, const float *x, const int32_t *choice, const uint16_t *w_gate_up,
                            int rows, int D, int I, int E);
int gk_skinny_expert_down(GkStream s, float *out, const float *act, const int32_t *choice, const float *gate,
                          const uint16_t *w_down, int rows, int I, int D, int E);

/* ---- a decoding step's layers as one persistent kernel (gpu_decode_layer.cu) ---- */
/* The residual merge fused with RMSNorm of rows [N, D] (gk_merge_rmsnorm_forward's arguments). */
typedef struct GkMergeNorm {
    float *out, *y, *rstd;
    const float *h, *res, *hs, *hb, *rs, *rb, *w;
} GkMergeNorm;
/* The step's first rows: x = (emb[tokens[r]] + bias) ⊙ scale (gk_embed_forward's), then u = RMSNorm(x; norm_w)
 * (gk_rmsnorm_forward's), [N, D] each. */
typedef struct GkEmbedNorm {
    const float *emb, *bias, *scale, *norm_w; /* emb: set where there is an embedding (its rows when emb16 is not) */
    const int32_t *tokens; /* [N], on the device */
    float *x, *u, *rstd;
    const uint16_t *emb16; /* NULL, or the rows' bf16 copy (gk_embed_forward's emb16) */
} GkEmbedNorm;
/* Rows the persistent layer takes (its 1-, 2- and 4-row forms, over a bf16 KV cache: each form is one huge kernel,
 * minutes of nvcc a target, so the 8-row and fp32-cache ones are left to the launches). */
#define GK_DECODE_LAYER_ROWS 4
/* A bf16 CCA layer with the MLP router and top-1 experts for N <= GK_DECODE_LAYER_ROWS rows, each the one new row of
 * its sequence, its cache bf16 (rows.kv_bf16), as one launch whose blocks run the launches of a decoding step's layer
 * as phases with a grid-wide barrier between them (every block resident at once: a cooperative launch): the previous
 * layer's merge normed where it was left here (merge_in), the projections of u (q | k straight into Xe's new rows, row
 * r's at r·TE + P, with the convolution state's P rows before them; vc, vd), the convolution at the new rows, CCA's
 * rows (gk_cca_decode_rows), attention over the cache (the same-length one: B = N sequences at p0; or the pool's,
 * att_table non-NULL), the output projection, the merge normed for the MoE block, the router's down projection and
 * tail, the experts' two products, and the merge normed for the next layer (unless left to the next layer). Each phase is
 * its launch's block body with that launch's thread counts: the same bits as the launches. At up to 2 rows every block
 * computes every row of the merges itself (the same bits) and reads the norm's rows from its shared memory, so the
 * merges need no barrier after them: with merge_in and the last merge left to the next layer, eight barriers a layer
 * and one between layers instead of ten and a launch. */
typedef struct GkDecodeLayer {
    const float *u;                   /* [N, D]: the input norm's rows (merge_in.out NULL), or where merge_in puts them */
    GkEmbedNorm embed_in;             /* emb NULL, or (the first layer, without merge_in) the embedding and its norm
                                         into x and u, run first here */
    GkMergeNorm merge_in;             /* out NULL, or the previous layer's MoE merge normed by this layer's input norm
                                         (x, u from its moe_out and x_mid), left by its kernel to run first here */
    GkSkinnyOut proj[4];              /* q | k into Xe, vc, vd */
    GkRowCopy xe_state;               /* the convolution state into Xe's first P rows of each block */
    float *Ye;                        /* convolution output, Xe's layout [N·TE, C] */
    const float *Xe, *conv_w0, *conv_b0, *conv_w1, *conv_b1;
    int TE, P, C, k0, k1;
    GkCcaDecode rows;                 /* Xe, Ye, ...: N rows of one new token each */
    float *attn_out;                  /* [N, Cq] */
    const float *query;               /* [N, Cq] */
    const void *k_cache, *v_cache;    /* float or bf16 (rows.kv_bf16) */
    const int32_t *att_seq, *att_pos, *att_table; /* the pool's (att_table NULL: the same-length cache) */
    int max_blocks, block_tokens, p0, max_len, window;
    float att_scale;
    GkAttnPieces att_pieces;          /* scratch for N rows, or {NULL} */
    GkSkinnyOut o_proj;               /* from attn_out, K = Hq·dh */
    GkMergeNorm merge_attn;           /* x_mid, u from the output projection and x */
    GkSkinnyOut router_down;          /* from u, K = D */
    GkRouterTail tail;
    float *act, *moe_out;             /* [N, I], [N, D] */
    const uint16_t *w_gate_up, *w_down;
    const int32_t *choice;
    const float *gate;
    GkMergeNorm merge_mlp;            /* x, u from moe_out and x_mid (the next layer's input norm, or the final one);
                                         out NULL: left to the next layer's merge_in (or the caller) */
    GkSkinnyOut next_proj[4];         /* the next layer's proj (w and n only; w NULL: none), asked of the L2 cache
                                         during the experts, each block its share as the next kernel's grid takes it */
    GkSkinnyOut head;                 /* the last layer's: logits [N, V] = bf16(u) lm_headᵀ after its merge_mlp (u the
                                         final norm's rows: gk_skinny_mm's bits), where the launch asks; w NULL: none */
    int N, D, Hq, Hkv, dh, I, E;
    float eps;
    unsigned *barrier;                /* a zeroed word on the device, this stream's own */
    int blocks;                       /* 0: as many as fit on the device at once (tests ask for fewer) */
} GkDecodeLayer;
/* Consecutive layers of a step in one launch: their plans, gk_decode_plan_bytes() each, written on the host by
 * gk_decode_plan (0; -1: a shape the phases do not take — rows, alignment, widths —, layers that differ in the launch's
 * shape, or not a chain: each layer but the first takes the one before's last merge as its merge_in, so only the last
 * may run its merge_mlp, and only a last layer that runs it may have a head; only the first may embed), then copied to
 * the device by the caller, once: a plan holds pointers and shapes that stay the same from step to step, the
 * same-length cache's layers being planned at position 0 (p0 and rows.kv_p0 0, the RoPE tables at their row 0).
 * gk_decode_layers runs n_layers of those plans (on the device) at the same-length cache's position p0 (0 for the
 * pool), first being the first layer's descriptor on the host, and the last layer's head (the logits' product) where
 * `head` is set: 0, or -1 having launched nothing (a grid the device refuses). Between layers a grid barrier replaces
 * the launch boundary, and the next layer's first weight pieces load across it. */
size_t gk_decode_plan_bytes(void);
int gk_decode_plan(const GkDecodeLayer *layers, int n_layers, void *plans);
int gk_decode_layers(GkStream s, const GkDecodeLayer *first, const void *plans, int n_layers, int p0, int head);
/* gk_grid_sync checked and timed: `reps` rounds over `blocks` blocks of the layer kernel's width, two barriers a round,
 * each block checking after the first that its neighbour's stamp of the round is visible. words: 1 + 2·blocks zeroed
 * words on the device (the barrier, the stamps, each block's count of stale stamps). -1: refused (nothing ran). */
int gk_grid_sync_probe(GkStream s, unsigned *words, int blocks, int reps);

/* ---- elementwise (gpu_optim.cu) ---- */
void gk_f32_to_bf16(GkStream s, uint16_t *dst, const float *src, long n); /* nearest even, as zy_f32_to_bf16 */
void gk_bf16_to_f32(GkStream s, float *dst, const uint16_t *src, long n); /* exact, as zy_bf16_to_f32 */
void gk_add_bf16_to_f32(GkStream s, float *dst, const uint16_t *src, long n); /* dst += widened src */
void gk_scale(GkStream s, float *x, float a, long n);                      /* x *= a */
/* *out (device double) += Σ x² over [0, n), fixed order. */
void gk_sumsq(GkStream s, double *out, const float *x, long n);

/* ---- the optimizer's multi-tensor AdamW pass (gpu_adamw.cu; the rest of the optimizer: gpu_optim.h) ---- */
/* A contiguous piece of one owned tensor (at most a few ten thousand elements): the unit of the AdamW launch (one
 * block each) and of the gradient norm's partial sums. flags: GPU_OPTIM_DECAY (AdamW: weight decay applies, the
 * tensor has 2+ dims), GPU_OPTIM_ROUTER (learns at lr × router_lr_scale). */
typedef struct {
    uint64_t off;   /* arena offset, in floats */
    uint32_t len;   /* elements */
    uint32_t flags;
} GpuOptimChunk;
enum { GPU_OPTIM_DECAY = 1, GPU_OPTIM_ROUTER = 2 };
/* A step's constants at one learning rate, as step_consts in optim.c. */
typedef struct {
    float mu, muon_decay;                              /* Muon: momentum, lr·wd */
    float step_size, eps, b1, b2, inv_bc2, adam_decay; /* AdamW: lr / (1 − β1^t), ε, β1, β2, 1 / √(1 − β2^t), 1 − lr·wd */
    /* each gradient is read as g·grad_scale (one rounding, the clipping multiply of grad_clip; 1: unclipped, exact),
     * so clipping needs no pass of its own over the gradient arena */
    float grad_scale;
    double lr;
} GkOptimStep;
/* AdamW over every chunk in one launch (a block each), adamw_elem of optim.c element for element (the same bits):
 * w, g the arenas, m, v the owned block's moments (index off − begin); a chunk flagged GPU_OPTIM_ROUTER takes k1,
 * the others k0. w16 (NULL: none): also writes bf16(w) (nearest even, as zy_f32_to_bf16) of each updated weight
 * at its offset, the bf16 products' copy, so no separate rounding pass reads the weights again. */
void gk_adamw(GkStream s, float *w, uint16_t *w16, const float *g, float *m, float *v, uint64_t begin,
              const GpuOptimChunk *chunks, int n_chunks, GkOptimStep k0, GkOptimStep k1);
/* Completes `batch` symmetric r × r matrices (row-major, leading dimension r, `stride` elements apart) whose upper
 * triangle, diagonal included, is computed: each entry below the diagonal becomes its mirror image above. Newton–
 * Schulz's banded symmetric products (ns_symmetric_bands, gpu_optim.cu) need it; nothing outside the lower triangles
 * is written. */
void gk_mirror_upper_f32(GkStream s, float *M, int r, long stride, int batch);
void gk_mirror_upper_bf16(GkStream s, uint16_t *M, int r, long stride, int batch);

#ifdef __cplusplus
}
#endif
#endif
